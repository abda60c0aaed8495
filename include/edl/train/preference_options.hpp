// edl/train/preference_options.hpp
// The options of the preference losses (train/preference.hpp), with TRL's DPOConfig and
// ORPOConfig names; a header of its own so that TrainingArguments can hold them without the
// loss code.
#pragma once

#include <string>

#include <edl/core/error.hpp>

namespace edl::train {

struct PreferenceOptions {
  std::string loss_type = "sigmoid";  // DPO: sigmoid | ipo
  double beta = 0.1;
  double label_smoothing = 0.0;       // DPO's sigmoid only (conservative DPO)
  bool orpo = false;                  // ORPO's odds-ratio loss instead of DPO (no reference model)

  void validate(const std::string& where) const {
    EDL_CHECK(loss_type == "sigmoid" || loss_type == "ipo", errc::config, where + " loss_type",
              "expected sigmoid or ipo, found \"", loss_type, "\"");
    EDL_CHECK(beta > 0, errc::config, where + " beta", "must be positive, found ", beta);
    EDL_CHECK(label_smoothing >= 0 && label_smoothing < 0.5, errc::config, where + " label_smoothing",
              "must be in [0, 0.5), found ", label_smoothing);
  }
};

}  // namespace edl::train
