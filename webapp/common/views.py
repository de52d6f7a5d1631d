"""Error pages: JSON under /api/ (the API's clients are programs), Django's pages elsewhere."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

from webapp.common.errors import BODY


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not _is_api(request):
        return defaults.bad_request(request, exception)
    if isinstance(exception, RequestDataTooBig):
        reason = (f"is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE // 2**20} MiB: "
                  "send it in smaller batches")
    else:
        reason = "is not a valid request"
    return JsonResponse({"detail": f"{BODY}: {reason}",
                         "errors": [{"field": BODY, "reason": reason}]}, status=400)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not _is_api(request):
        return defaults.page_not_found(request, exception)
    return JsonResponse({"detail": f"no API endpoint at {request.path}"}, status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    if not _is_api(request):
        return defaults.server_error(request)
    return JsonResponse({"detail": "internal server error (logged on the server)"}, status=500)
