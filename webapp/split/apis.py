"""REST endpoints of split learning (browser session): the shared instances, studies (list,
create, detail with their schedules), the comparison of a study's schedules and a schedule's
Gantt bars."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.common.api import get_or_404, validated
from webapp.common.exceptions import Conflict
from webapp.common.schema import errors
from webapp.split import selectors, services
from webapp.split.models import SplitSchedule, SplitStudy
from webapp.split.serializers import (
    SharedInstanceOutput,
    SplitCompareOutput,
    SplitGanttOutput,
    SplitStudyCreateInput,
    SplitStudyDetailOutput,
    SplitStudyOutput,
)


def _study(study_id: int) -> SplitStudy:
    return get_or_404(selectors.split_study_list(), study_id, what="split study")


class SharedInstanceListApi(APIView):
    @extend_schema(responses={200: SharedInstanceOutput(many=True), **errors(401)})
    def get(self, request: Request) -> Response:
        return Response(SharedInstanceOutput(selectors.shared_instance_choices(), many=True).data)


class SplitStudyListCreateApi(APIView):
    @extend_schema(responses={200: SplitStudyOutput(many=True), **errors(401)})
    def get(self, request: Request) -> Response:
        return Response(SplitStudyOutput(selectors.split_study_list(), many=True).data)

    @extend_schema(request=SplitStudyCreateInput,
                   responses={201: SplitStudyDetailOutput, **errors(400, 401, 403)})
    def post(self, request: Request) -> Response:
        study = services.split_study_create(**validated(SplitStudyCreateInput, request),
                                            created_by=request.user)
        return Response(SplitStudyDetailOutput(_study(study.pk)).data,
                        status=status.HTTP_201_CREATED)


class SplitStudyDetailApi(APIView):
    @extend_schema(responses={200: SplitStudyDetailOutput, **errors(401, 404)})
    def get(self, request: Request, study_id: int) -> Response:
        return Response(SplitStudyDetailOutput(_study(study_id)).data)


class SplitStudyCompareApi(APIView):
    @extend_schema(responses={200: SplitCompareOutput, **errors(401, 404)})
    def get(self, request: Request, study_id: int) -> Response:
        return Response(SplitCompareOutput(selectors.split_compare(study=_study(study_id))).data)


class SplitScheduleGanttApi(APIView):
    @extend_schema(responses={200: SplitGanttOutput, **errors(
        401, 404, 409, conflict="The schedule is not computed (pending, running or failed).")})
    def get(self, request: Request, study_id: int, schedule_id: int) -> Response:
        study = _study(study_id)
        schedule = get_or_404(SplitSchedule.objects.filter(study=study), schedule_id,
                              what=f"schedule of split study {study.pk}")
        if schedule.status != SplitSchedule.Status.DONE:
            raise Conflict(f"schedule {schedule.pk} ({schedule.method}) is {schedule.status}: "
                           "it has no Gantt yet", state=schedule.status, action="draw its Gantt")
        return Response(SplitGanttOutput(selectors.split_schedule_gantt(schedule=schedule)).data)
