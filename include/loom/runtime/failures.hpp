#pragma once
// One failure, one error on every rank. A rank that fails publishes why in the rendezvous store
// before it throws, and a rank whose collective then breaks reports that reason rather than the
// transport's "connection closed". A transport that breaks with nothing published means a peer
// died or stopped without a word (SIGKILL, a segfault, the OOM killer): the ranks that still answer
// take a roll call in the store and name the ranks that did not.

#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace c10d {
class Store;
}

namespace loom {

class runtime;

// loom's error for a failure of the job, thrown on every rank whichever rank it began on.
class job_failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An exception's message without the C++ backtrace that c10::Error's what() carries.
[[nodiscard]] std::string error_text(const std::exception& error);

// Publishes `message` for the other ranks (the first failure published is the one they report),
// then throws job_failure("loom: " + message).
[[noreturn]] void fail_job(const runtime& rt, const std::string& message);

// The failure a rank published, as "rank R failed: ...".
[[nodiscard]] std::optional<std::string> published_failure(const runtime& rt);

// The same on a store connection of one's own (the heartbeat's); throws when the store is gone.
[[nodiscard]] std::optional<std::string> read_published_failure(c10d::Store& store);
// Publishes `message` as rank `rank`'s failure, unless one is published already; quiet when the
// store is gone.
void publish_failure(c10d::Store& store, int rank, const std::string& message);

// A failure the heartbeat read in the store while this rank waited: rethrow_as_job_failure reports
// it when the wait breaks because rank 0, which hosts the store, is gone with it.
void remember_published_failure(std::string failure);

// Rethrows `error`, which ended this rank's `during` (e.g. "backward pass"), as the job's
// error on this rank:
// - a job_failure, already published, as it is;
// - when a peer published a failure, a job_failure that names it;
// - a broken transport (Gloo's, or c10d's Dist errors) with nothing published: a job_failure that
//   names the ranks that did not answer the roll call, or rank 0 when the store it hosts is gone;
// - anything else is this rank's own failure: published for the others, then rethrown unchanged.
[[noreturn]] void rethrow_as_job_failure(const runtime& rt, std::exception_ptr error, std::string_view during);

// Runs `work` (writing a file, say) on rank 0 alone, and returns on every rank once it is done. When
// it throws, every rank throws: rank 0 its own error, published, the others a job_failure naming it.
void run_on_rank_zero(const runtime& rt, std::string_view what, const std::function<void()>& work);
// The same with every rank doing its part (writing its own file, say).
void run_on_every_rank(const runtime& rt, std::string_view what, const std::function<void()>& work);

}  // namespace loom
