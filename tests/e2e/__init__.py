"""End-to-end tests: real uvicorn, real headless Chromium, a real Prometheus (marked e2e)."""
