"""``python -m tutti`` runs the CLI."""

from tutti.cli import main

main()
