"""rec.data: sources of RecBatch (synthetic, Criteo TSV, CSV, Parquet)."""
