"""FTW, FreeToken's own weights file: format, writer, reader, loading, and the conversion from GGUF."""
