"""Built-in usage-limit policies: per-priority saturation ceilings."""
