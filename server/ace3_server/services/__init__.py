"""Business logic between the HTTP routes (or the CLI) and the database and artifact store."""
