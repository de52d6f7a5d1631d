"""Reads on devices, enrolment tokens, model specs and layer profiles."""

from __future__ import annotations

from django.db.models import QuerySet

from orchestrator.errors import PlanningError
from orchestrator.formats import Resource
from orchestrator.protocol import DeviceResource, ProtocolError
from webapp.common.secrets import secret_hash, secret_matches
from webapp.devices.models import Device, DeviceLink, EnrollmentToken, LayerProfile, ModelSpec

# Compared against when the uid is unknown, so that a wrong uid costs the same as a wrong key.
_DUMMY_HASH = secret_hash("no-such-device")

# The agents' zoo (agent/zoo.py, which the server does not import): each model's number of
# cuttable layers, the same for every input shape. tests/webapp/devices/test_profile_limits.py
# checks it against the zoo.
ZOO_NUM_LAYERS = {"mlp": 4, "vgg5": 5, "resnet18": 10, "mobilenetv2": 20, "alexnet": 8}
# the layers of a model outside the zoo (a profile measured elsewhere, data/profiles) before a
# profile of it fixes their number
MAX_PROFILE_LAYERS = 1000


def enrollment_token_list() -> QuerySet[EnrollmentToken]:
    return EnrollmentToken.objects.select_related("created_by")


def device_list(*, status: str | None = None) -> QuerySet[Device]:
    devices = Device.objects.all()
    if status is not None:
        devices = devices.filter(status=status)
    return devices


def device_by_credentials(*, uid: str, key: str) -> Device | None:
    """The device whose uid and key these are, if it is not retired."""
    device = Device.objects.filter(uid=uid).first()
    stored = device.key_hash if device is not None and device.key_hash else _DUMMY_HASH
    if not secret_matches(key, stored) or device is None or not device.key_hash:
        return None
    return device


def model_spec_list() -> QuerySet[ModelSpec]:
    return ModelSpec.objects.all()


def model_num_layers(*, model_spec: ModelSpec, exclude_device: Device | None = None
                     ) -> int | None:
    """How many layers ``model_spec``'s model has: the zoo's number for a zoo model; for
    another, that of the spec's first profile (of a device other than ``exclude_device``, whose
    own profile a new upload replaces); None when nothing says yet."""
    if model_spec.model in ZOO_NUM_LAYERS:
        return ZOO_NUM_LAYERS[model_spec.model]
    profiles = LayerProfile.objects.filter(model_spec=model_spec)
    if exclude_device is not None:
        profiles = profiles.exclude(device=exclude_device)
    first: int | None = (profiles.order_by("measured_at", "pk")
                         .values_list("num_layers", flat=True).first())
    return first


def layer_profile_list(*, device_id: int | None = None, model_spec_id: int | None = None
                       ) -> QuerySet[LayerProfile]:
    profiles = LayerProfile.objects.select_related("device", "model_spec")
    if device_id is not None:
        profiles = profiles.filter(device_id=device_id)
    if model_spec_id is not None:
        profiles = profiles.filter(model_spec_id=model_spec_id)
    return profiles


def device_link_list() -> QuerySet[DeviceLink]:
    return DeviceLink.objects.select_related("source", "target")


def planning_costs(*, device: Device, profile: LayerProfile | None
                   ) -> tuple[float, float, float | None]:
    """``(overhead_s, message_s, pass_overhead_s)`` of ``device`` for planning a model it has
    ``profile`` of: as runs measured them (kept with the profile), else its agent's probes (the
    device's own), which measure none inside the passes (``pass_overhead_s`` None)."""
    overhead, message = device.overhead_s, device.message_s
    in_passes = None
    if profile is not None:
        if profile.overhead_s is not None:  # a run's, with the part inside its passes
            overhead, in_passes = profile.overhead_s, profile.pass_overhead_s
        message = message if profile.message_s is None else profile.message_s
    return overhead, message, in_passes


def planning_resources(*, device: Device, speed: float) -> tuple[Resource, ...]:
    """The device's compute resources as planning takes them: the ones its agent reported
    (relative speeds), scaled so that their speeds sum to ``speed``, the device's planning
    speed (the formats' rule), each one's backward speed by the same factor (its
    backward/forward ratio is what a forward/backward split plays on). None reported: ()."""
    try:
        reported = [DeviceResource.from_json(r) for r in device.resources or ()]
    except ProtocolError as exc:
        raise PlanningError(f"device {device.name!r} ({device.uid}) has malformed resources: "
                            f"{exc}") from None
    if not reported:
        return ()
    scale = speed / sum(r.speed for r in reported)
    return tuple(Resource(kind=r.kind, speed=r.speed * scale,
                          backward_speed=r.backward_speed * scale) for r in reported)
