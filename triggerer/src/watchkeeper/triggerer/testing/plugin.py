"""pytest plugin of the test kit."""
