"""The basicauth extension: HTTP Basic authentication, checked against htpasswd by servers and sent by clients."""
