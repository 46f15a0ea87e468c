"""Where backends and their log feeds come from besides the static list."""
