"""The refresolve service: reference listing, mention resolution and expansion (REF-*)."""
