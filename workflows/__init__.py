"""The gate graph (one source of truth), its Hera builders, the local runner and the CLI."""
