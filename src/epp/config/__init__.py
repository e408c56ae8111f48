"""EndpointPickerConfig: schema, loading, and building plugins from it, all or nothing."""
