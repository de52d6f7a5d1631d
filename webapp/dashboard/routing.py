from django.urls import path

from webapp.dashboard.consumers import DevicesConsumer, RunConsumer

websocket_urlpatterns = [
    path("ws/runs/<int:run_id>/", RunConsumer.as_asgi()),
    path("ws/devices/", DevicesConsumer.as_asgi()),
]
