"""The memories app's HTTP interfaces, one module per area; memories/urls.py joins them."""
