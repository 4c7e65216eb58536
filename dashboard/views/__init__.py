"""Dashboard pages, one module per area. Each view is wrapped in dashboard.access.dashboard_page,
which resolves the session's Principal and renders refusals; the views themselves stay thin:
read through selectors, change through services (docs/architecture.md §10)."""
