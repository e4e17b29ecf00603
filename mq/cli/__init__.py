"""Command-line entry points (mqnamesrv, mqbroker, mqadmin arrive with the broker)."""
