"""collscope node agent: reads trace rings and exports trace bundles (see spec/bundle-v1.md)."""
