"""The built-in parser plugins, one per module; the helpers (gojson, sse, usage, json_rewrite) sit beside."""
