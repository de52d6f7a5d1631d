"""Factories for the webapp's rows (factory_boy)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import factory
import zmq
from django.contrib.auth import get_user_model
from django.utils import timezone
from factory.django import DjangoModelFactory

from webapp.common.secrets import secret_digest, secret_hash
from webapp.devices.models import Device, EnrollmentToken, LayerProfile, ModelSpec
from webapp.runs.models import Plan, Run, RunDevice


def profile_document(*, model: str = "mlp", batch_size: int = 32, layers: int = 4,
                     scale: float = 1.0) -> dict[str, Any]:
    """A small valid model profile; ``scale`` multiplies every time (a slower device)."""
    return {"model": model, "batch_size": batch_size, "reference": "test",
            "layers": [{"name": f"l{i}", "kind": "linear", "forward_s": 0.01 * (i + 1) * scale,
                        "backward_s": 0.02 * (i + 1) * scale, "output_bytes": 4096,
                        "param_bytes": 65536, "activation_bytes": 8192}
                       for i in range(layers)]}


class UserFactory(DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pass-word-1")


class EnrollmentTokenFactory(DjangoModelFactory):
    """A token whose secret is ``token.secret`` (pass ``secret=...`` to choose it)."""

    class Meta:
        model = EnrollmentToken
        skip_postgeneration_save = True


    label = "test"
    token_digest = factory.Sequence(lambda n: f"unset-{n}")
    created_by = factory.SubFactory(UserFactory)
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1))

    @factory.post_generation
    def secret(obj: EnrollmentToken, create: bool, extracted: str | None, **kwargs: Any) -> None:
        obj.secret = extracted or f"ept_test-{uuid.uuid4().hex}"
        obj.prefix = obj.secret[:10]
        obj.token_digest = secret_digest(obj.secret)
        if create:
            obj.save(update_fields=["prefix", "token_digest"])


# a CURVE public key (Z85), for an agent's hello
DATA_KEY = 'Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID'


class DeviceFactory(DjangoModelFactory):
    """A device whose key is ``device.key`` (pass ``key=...`` to choose it)."""

    class Meta:
        model = Device
        skip_postgeneration_save = True

    uid = factory.Sequence(lambda n: f"dev-{n:04d}")
    name = factory.Sequence(lambda n: f"device {n}")
    memory_bytes = 4 * 2**30
    bandwidth_bps = 12_500_000.0
    latency_s = 0.002
    last_heartbeat_at = factory.LazyFunction(timezone.now)
    # a connected agent's data plane (runs deploy only to devices with one)
    data_address = factory.Sequence(lambda n: f"tcp://127.0.0.1:{20000 + n}")
    data_key = factory.LazyFunction(lambda: zmq.curve_keypair()[0].decode("ascii"))
    key_hash = ""

    @factory.post_generation
    def key(obj: Device, create: bool, extracted: str | None, **kwargs: Any) -> None:
        obj.key = extracted or f"edk_test-key-of-{obj.uid}"
        obj.key_hash = secret_hash(obj.key)
        if create:
            obj.save(update_fields=["key_hash"])


class ModelSpecFactory(DjangoModelFactory):
    class Meta:
        model = ModelSpec
        django_get_or_create = ("model", "dataset", "batch_size")

    model = "mlp"
    dataset = "digits"
    batch_size = 32


class LayerProfileFactory(DjangoModelFactory):
    class Meta:
        model = LayerProfile

    class Params:
        layers = 4
        scale = 1.0

    device = factory.SubFactory(DeviceFactory)
    model_spec = factory.SubFactory(ModelSpecFactory)
    document = factory.LazyAttribute(lambda o: profile_document(
        model=o.model_spec.model, batch_size=o.model_spec.batch_size, layers=o.layers,
        scale=o.scale))
    num_layers = factory.LazyAttribute(lambda o: len(o.document["layers"]))
    forward_s = factory.LazyAttribute(lambda o: sum(la["forward_s"] for la in o.document["layers"]))
    backward_s = factory.LazyAttribute(
        lambda o: sum(la["backward_s"] for la in o.document["layers"]))


class RunFactory(DjangoModelFactory):
    """A draft run; ``devices=[...]`` (default: two new devices) are added in that order."""

    class Meta:
        model = Run
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"run {n}")
    model_spec = factory.SubFactory(ModelSpecFactory)
    algorithms = factory.LazyFunction(lambda: ["ftpipehd"])
    schedule = "1f1b"
    microbatches = 4

    @factory.post_generation
    def devices(obj: Run, create: bool, extracted: list[Device] | None, **kwargs: Any) -> None:
        chosen = extracted if extracted is not None else [DeviceFactory(), DeviceFactory()]
        RunDevice.objects.bulk_create(RunDevice(run=obj, device=d, position=k)
                                      for k, d in enumerate(chosen))


class PlanFactory(DjangoModelFactory):
    class Meta:
        model = Plan

    run = factory.SubFactory(RunFactory)
    algorithm = "ftpipehd"
    status = Plan.Status.DONE
    stages = 2
    period_s = 0.2
    throughput_sps = 160.0
    bottleneck = "stage 0 compute"
    memory_ok = True
    planner_s = 0.001
