// Factories of the architecture implementations (one file each).
#pragma once

#include <memory>

#include "model/model.h"

namespace strata {

std::unique_ptr<Model> NewLlamaModel(std::unique_ptr<GgufFile> file, const ModelConfig& config);
std::unique_ptr<Model> NewDeepseek2Model(std::unique_ptr<GgufFile> file, const ModelConfig& config);
std::unique_ptr<Model> NewGemma3Model(std::unique_ptr<GgufFile> file, const ModelConfig& config);
std::unique_ptr<Model> NewKimiLinearModel(std::unique_ptr<GgufFile> file, const ModelConfig& config);

}  // namespace strata
