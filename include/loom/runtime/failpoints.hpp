#pragma once
// Failpoints: named places where a test can make this process die on the spot, as a power cut or
// the OOM killer would, to check that nothing is lost (a checkpoint half written, say). Inert
// unless the environment names one:
//   LOOM_FAILPOINT=checkpoint.after-shard       the place (see the call sites' names)
//   LOOM_FAILPOINT_HIT=2                        die at its 2nd pass (default 1)
//   LOOM_FAILPOINT_RANK=1                       only on this rank (default: every rank)
//   LOOM_FAILPOINT_RESTART=0                    only in the attempt of this TORCHELASTIC_RESTART_COUNT
//                                               (default: every attempt of loom-run --max-restarts)
//   LOOM_FAILPOINT_ERRNO=ENOSPC                 fail the call there with this error instead of
//                                               dying (ENOSPC, EDQUOT or EIO: a disk that fills up)
//   LOOM_FAILPOINT_SIGNAL=SIGSTOP               raise this signal instead of SIGKILL (SIGSTOP: a
//                                               rank that is alive but silent, as a hung one is)
//   LOOM_FAILPOINT_SLEEP_S=8                    sleep this long there instead, and go on (a rank
//                                               that is merely slow)
//   LOOM_FAILPOINT_VALUE=nan                    multiply the value computed there by this one (nan,
//                                               inf or -inf: a loss that goes non-finite) instead
//   LOOM_FAILPOINT_SKIP=1                       skip what is done there instead (collective.issue: a
//                                               collective this rank never issues, as in a branch
//                                               that only some ranks take)

#include <optional>
#include <string_view>

namespace loom {

// Dies by SIGKILL (or raises LOOM_FAILPOINT_SIGNAL, or sleeps) when the environment selects `name`
// on this rank and this is the chosen pass (and names no LOOM_FAILPOINT_ERRNO, _VALUE or _SKIP).
void failpoint(std::string_view name);

// The errno that the call at `name` must fail with when the environment selects `name` with
// LOOM_FAILPOINT_ERRNO on this rank and this is the chosen pass; otherwise 0.
[[nodiscard]] int injected_error(std::string_view name);

// The factor that the value computed at `name` must be multiplied by when the environment selects
// `name` with LOOM_FAILPOINT_VALUE on this rank and this is the chosen pass; otherwise nothing.
[[nodiscard]] std::optional<double> injected_value(std::string_view name);

// Whether what is done at `name` must be skipped: the environment selects `name` with
// LOOM_FAILPOINT_SKIP on this rank and this is the chosen pass.
[[nodiscard]] bool injected_skip(std::string_view name);

}  // namespace loom
