"""The run configuration: its typed keys and the schema that builds them from YAML (no registries needed)."""
