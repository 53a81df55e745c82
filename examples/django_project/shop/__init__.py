"""A Django app whose tasks charge a payment provider through the flow queue ``payments``."""
