"""Reports: rich terminal tables (plots and HTML come with the report issue)."""
