"""Running a server: the admin memory endpoint, metrics, graceful shutdown, giving the C heap back."""
