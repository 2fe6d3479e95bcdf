//! Executors for attention backends (filled in by the adapter-layer work).
