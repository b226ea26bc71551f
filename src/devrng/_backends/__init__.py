"""Built-in device backends, one module per device type; each is imported on first use."""
