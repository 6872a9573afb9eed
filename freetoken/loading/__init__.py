"""Building a model from a checkpoint: read config -> model skeleton -> expert pool -> experts backend
-> attach (models/ holds the architectures it builds)."""
