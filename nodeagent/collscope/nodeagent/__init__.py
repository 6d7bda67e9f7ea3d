"""collscope node agent: reads trace rings, exports trace bundles (see docs/spec/bundle-v1.md)."""
