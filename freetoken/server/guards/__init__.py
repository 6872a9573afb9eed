"""What keeps the server safe: drive-by requests, body limits, slow clients, keys, log privacy, private files."""
