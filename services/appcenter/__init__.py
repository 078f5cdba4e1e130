"""The store-backed AppCenter backend (REF-BACKEND-1): app trees, listings and loads."""
