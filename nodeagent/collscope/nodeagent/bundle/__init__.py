"""Trace bundles, version 1 (docs/spec/bundle-v1.md): models, columnar tables, reader and writer.

Import the module you need: ``from collscope.nodeagent.bundle import reader`` then
``reader.load(path)``; ``models`` holds the per-line pydantic models, ``tables`` the in-memory
columnar ``Bundle`` that analysis consumes, ``writer`` the serialiser.
"""
