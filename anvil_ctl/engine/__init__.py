"""The transaction engine: runs plans through guards and steps, journaling every move."""
