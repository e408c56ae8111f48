"""Live data about endpoints, pulled from model servers."""
