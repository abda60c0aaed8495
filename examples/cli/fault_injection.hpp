// examples/cli/fault_injection.hpp: EDL_FAULT_INJECTION, the fault-injection knob of
// `edl train` for tests of the distributed failure paths (docs/distributed.md). Unset in
// normal use; when set, one rank misbehaves on purpose:
//
//   EDL_FAULT_INJECTION=kill:rank=1,step=3        rank 1 kills itself (SIGKILL) after step 3, as a crashed node
//   EDL_FAULT_INJECTION=hang:rank=1,step=3        rank 1 stops answering after step 3, as a hung node
//   EDL_FAULT_INJECTION=fail_save:rank=1,step=4   rank 1 fails to write its part of checkpoint-4
//
// rank defaults to 0 and step to 1. A malformed value is an edl::Error (invalid_argument)
// naming the variable, so a typo never runs a test without its fault.
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include <edl/core/error.hpp>
#include <edl/train/trainer.hpp>

namespace edl::cli {

struct FaultInjection {
  enum class Action { none, kill, hang, fail_save };
  Action action = Action::none;
  int rank = 0;
  std::int64_t step = 1;
};

inline constexpr const char* kFaultInjectionVar = "EDL_FAULT_INJECTION";

/// Parses EDL_FAULT_INJECTION (see the header comment); none when unset or empty.
inline FaultInjection fault_injection_from_env() {
  FaultInjection f;
  const char* v = std::getenv(kFaultInjectionVar);
  if (!v || !*v) return f;
  const std::string s = v;
  const std::string expected = "expected kill|hang|fail_save[:rank=R,step=K], found \"" + s + "\"";
  const std::size_t colon = s.find(':');
  const std::string action = s.substr(0, colon);
  if (action == "kill") f.action = FaultInjection::Action::kill;
  else if (action == "hang") f.action = FaultInjection::Action::hang;
  else if (action == "fail_save") f.action = FaultInjection::Action::fail_save;
  else throw Error(errc::invalid_argument, kFaultInjectionVar, expected);
  std::size_t pos = colon == std::string::npos ? s.size() : colon + 1;
  while (pos < s.size()) {
    const std::size_t comma = s.find(',', pos);
    const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? s.size() : comma + 1;
    const std::size_t eq = item.find('=');
    EDL_CHECK(eq != std::string::npos, errc::invalid_argument, kFaultInjectionVar, expected);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    char* end = nullptr;
    const long long n = std::strtoll(value.c_str(), &end, 10);
    EDL_CHECK(!value.empty() && *end == '\0' && n >= 0, errc::invalid_argument, kFaultInjectionVar, expected);
    if (key == "rank") f.rank = static_cast<int>(n);
    else if (key == "step") f.step = n;
    else throw Error(errc::invalid_argument, kFaultInjectionVar, expected);
  }
  return f;
}

/// Installs the fault of EDL_FAULT_INJECTION into `t` when it names this process's rank.
template <class TrainerT>
void install_fault_injection(TrainerT& t) {
  const FaultInjection f = fault_injection_from_env();
  if (f.action == FaultInjection::Action::none || f.rank != t.processes().rank()) return;
  if (f.action == FaultInjection::Action::fail_save) {
    t.checkpoint_hooks.after_file = [&t, f](const std::string& file) {
      if (t.state().step == f.step)
        throw Error(errc::io, file, "fault injected by " + std::string(kFaultInjectionVar) + " on rank " +
                                        std::to_string(f.rank));
    };
    return;
  }
  typename TrainerT::Callback cb;
  cb.on_step_end = [f](TrainerT&, const train::StepMetrics& m) {
    if (m.step != f.step) return true;
    if (f.action == FaultInjection::Action::kill) std::raise(SIGKILL);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // hang: never answer again
  };
  t.callbacks.push_back(cb);
}

}  // namespace edl::cli
