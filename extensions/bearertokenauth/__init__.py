"""The bearertokenauth extension: a static bearer token, checked by servers and sent by clients."""
