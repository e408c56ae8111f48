"""Built-in data sources: scraping and notifications."""
