"""Built-in fairness policies: which flow of a priority band dispatches next."""
