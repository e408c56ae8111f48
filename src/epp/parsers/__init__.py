"""Request parsers: bytes on the wire to a RequestBody, response bytes to usage."""
