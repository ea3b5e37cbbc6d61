"""Driver records (progress, result) ⇄ ``gambit.v1`` messages and plain dicts (for Ray handles)."""

from __future__ import annotations


def progress_msg(pb2, d: dict):
    return pb2.Progress(run_id=d["run_id"], round=d["round"], active=d["active"], ghost=d["ghost"],
                        pruned=d["pruned"], branched=d["branched"], finished=d["finished"],
                        tokens=d["tokens"], kv_usage=d["kv_usage"], elapsed_s=d["elapsed_s"],
                        votes=[pb2.Vote(answer=a, weight=w) for a, w in d.get("votes", {}).items()])


def result_msg(pb2, d: dict, first_event_s: float = 0.0, scorer_s: float = 0.0, engine_s: float = 0.0,
               fallbacks: int = 0):
    votes = [pb2.Vote(answer=a, weight=w) for a, w in d["majority_votes"].items()]
    wvotes = [pb2.Vote(answer=a, weight=w) for a, w in d["weighted_votes"].items()]
    traces = [pb2.TraceSummary(**t) for t in d["traces"]]
    return pb2.Result(
        run_id=d["run_id"], status=d["status"], answer=d["answer"], majority_answer=d["majority_answer"],
        weighted_answer=d["weighted_answer"], majority_votes=votes, weighted_votes=wvotes, traces=traces,
        generated_tokens=d["generated_tokens"], prompt_tokens=d["prompt_tokens"], rounds=d["rounds"],
        timings=pb2.Timings(total_s=d["total_s"], first_event_s=first_event_s,
                            scorer_s=d.get("scorer_s", scorer_s), engine_s=d.get("engine_s", engine_s)),
        scorer_fallbacks=d.get("scorer_fallbacks", fallbacks), message=d.get("message", ""),
        solution=d.get("solution", ""), solution_trace=d.get("solution_trace", -1))


SETTINGS = ("method", "decoding", "capacity", "swap", "round_interval", "max_tokens", "temperature", "seed",
            "timeout_s", "top_p", "top_k", "raw_prompt", "answer_rule", "max_total_tokens")


def settings_msg(pb2, cfg: dict):
    """The settings a run uses (a ``SolveConfig`` as a dict) as the ``SolveRequest`` that asks for them
    explicitly: what RunStarted and RunInfo report, the server's defaults filled in."""
    return pb2.SolveRequest(**{k: cfg[k] for k in SETTINGS if k in cfg})


def event_msg(pb2, d: dict):
    if d["kind"] == "started":
        return pb2.SolveEvent(started=pb2.RunStarted(run_id=d["run_id"], replica=d["replica"],
                                                     resumed=d.get("resumed", False)))
    if d["kind"] == "progress":
        return pb2.SolveEvent(progress=progress_msg(pb2, d))
    return pb2.SolveEvent(result=result_msg(pb2, d))
