factory = None  # written later
