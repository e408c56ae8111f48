"""Request control: parse, enrich, admit, schedule and follow each request to its end."""
