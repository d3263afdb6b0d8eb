"""The ``/api/v1`` routers, one module per page of the WebUI's world."""
