"""The Streamlit dashboard, a thin client of the daemon API."""
