"""The store-backed IssueManager backend (REF-BACKEND-1): issues, topic outputs and loads."""
