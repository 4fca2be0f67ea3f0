#include "eval/report.h"

#include <algorithm>
#include <cmath>

#include "kv/geometry.h"

namespace strata::eval {

nlohmann::json MakeReport(const std::string& command, const std::string& model_path,
                          const Model& model, double elapsed_s,
                          const std::vector<std::string>& notes, nlohmann::json skipped,
                          nlohmann::json section, const std::vector<std::string>& warnings) {
  const ModelConfig& c = model.config();
  int64_t full_bpt = 0;
  int n_mla = 0;
  const std::vector<LayerGeometry> layers = model.CacheLayers();
  for (const auto& g : layers) {
    full_bpt += g.bytes_per_token();
    n_mla += g.kind == AttnKind::kMla;
  }
  nlohmann::json j;
  j["schema_version"] = kReportSchemaVersion;
  j["command"] = command;
  j["model"] = {{"path", model_path},
                {"n_vocab", c.n_vocab},
                {"d_model", c.d_model},
                {"cache_layers", static_cast<int64_t>(layers.size())},
                {"mla_layers", n_mla},
                {"full_cache_bytes_per_token", full_bpt},
                {"values_per_token", full_bpt / 2},
                // Per layer kind: MLA/GQA rows grow with the context (full_cache_bytes_per_token);
                // a recurrent (KDA) state is fixed per sequence.
                {"recurrent_layers", model.RecurrentLayers().n_layers},
                {"recurrent_state_bytes_per_sequence",
                 model.RecurrentLayers().bytes_per_sequence()}};
  j["elapsed_s"] = elapsed_s;
  j["notes"] = notes;
  j["warnings"] = warnings;
  j["skipped"] = skipped.is_null() ? nlohmann::json::array() : std::move(skipped);
  j[command] = std::move(section);
  return j;
}

namespace {

using nlohmann::json;

bool HasType(const json& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "integer") {
    if (v.is_number_integer()) return true;
    return v.is_number_float() && std::isfinite(v.get<double>()) &&
           v.get<double>() == std::floor(v.get<double>());
  }
  if (t == "number") return v.is_number();
  return false;
}

class Validator {
 public:
  explicit Validator(const json& root) : root_(root) {}

  Status Check(const json& s, const json& v, const std::string& path, int depth = 0) const {
    if (depth > 64) return InvalidArgument(path + ": schema nesting too deep ($ref loop?)");
    if (s.is_boolean()) {
      return s.get<bool>() ? OkStatus() : InvalidArgument(path + ": no value allowed here");
    }
    if (!s.is_object()) return OkStatus();
    if (auto it = s.find("$ref"); it != s.end()) {
      const std::string ref = it->get<std::string>();
      const json* target = nullptr;
      for (const char* prefix : {"#/definitions/", "#/$defs/"}) {
        const std::string p = prefix;
        if (ref.rfind(p, 0) == 0) {
          const std::string key = p.substr(2, p.size() - 3);
          const std::string name = ref.substr(p.size());
          if (root_.contains(key) && root_[key].contains(name)) target = &root_[key][name];
        }
      }
      if (!target) return InvalidArgument(path + ": unresolvable $ref '" + ref + "'");
      RETURN_IF_ERROR(Check(*target, v, path, depth + 1));
    }
    if (auto it = s.find("type"); it != s.end()) {
      bool ok = false;
      std::string names;
      if (it->is_string()) {
        ok = HasType(v, it->get<std::string>());
        names = it->get<std::string>();
      } else {
        for (const auto& t : *it) {
          ok = ok || HasType(v, t.get<std::string>());
          if (!names.empty()) names += '|';
          names += t.get<std::string>();
        }
      }
      if (!ok) {
        return InvalidArgument(path + ": expected " + names + ", got " + v.type_name() + " " +
                               v.dump().substr(0, 60));
      }
    }
    if (auto it = s.find("enum"); it != s.end()) {
      if (std::find(it->begin(), it->end(), v) == it->end()) {
        return InvalidArgument(path + ": " + v.dump() + " is not one of " + it->dump());
      }
    }
    if (auto it = s.find("const"); it != s.end() && *it != v) {
      return InvalidArgument(path + ": " + v.dump() + " must be " + it->dump());
    }
    if (v.is_number()) {
      const double x = v.get<double>();
      if (auto it = s.find("minimum"); it != s.end() && x < it->get<double>()) {
        return InvalidArgument(path + ": " + v.dump() + " < minimum " + it->dump());
      }
      if (auto it = s.find("maximum"); it != s.end() && x > it->get<double>()) {
        return InvalidArgument(path + ": " + v.dump() + " > maximum " + it->dump());
      }
    }
    if (v.is_object()) {
      if (auto it = s.find("required"); it != s.end()) {
        for (const auto& k : *it) {
          if (!v.contains(k.get<std::string>())) {
            return InvalidArgument(path + ": missing required key '" + k.get<std::string>() + "'");
          }
        }
      }
      const json* props = s.contains("properties") ? &s["properties"] : nullptr;
      for (auto it = v.begin(); it != v.end(); ++it) {
        const std::string child = path + "/" + it.key();
        if (props && props->contains(it.key())) {
          RETURN_IF_ERROR(Check((*props)[it.key()], it.value(), child, depth + 1));
        } else if (auto ap = s.find("additionalProperties"); ap != s.end()) {
          if (ap->is_boolean() && !ap->get<bool>()) {
            return InvalidArgument(child + ": key not allowed by the schema");
          }
          RETURN_IF_ERROR(Check(*ap, it.value(), child, depth + 1));
        }
      }
    }
    if (v.is_array()) {
      if (auto it = s.find("minItems"); it != s.end() && v.size() < it->get<size_t>()) {
        return InvalidArgument(path + ": " + std::to_string(v.size()) + " items < minItems " +
                               it->dump());
      }
      if (auto it = s.find("items"); it != s.end()) {
        for (size_t i = 0; i < v.size(); ++i) {
          RETURN_IF_ERROR(Check(*it, v[i], path + "/" + std::to_string(i), depth + 1));
        }
      }
    }
    if (auto it = s.find("allOf"); it != s.end()) {
      for (const auto& sub : *it) RETURN_IF_ERROR(Check(sub, v, path, depth + 1));
    }
    if (auto it = s.find("anyOf"); it != s.end()) {
      Status first;
      for (const auto& sub : *it) {
        Status st = Check(sub, v, path, depth + 1);
        if (st.ok()) return OkStatus();
        if (first.ok()) first = st;
      }
      return first.WithContext(path + ": no anyOf branch matches");
    }
    if (auto it = s.find("oneOf"); it != s.end()) {
      int n = 0;
      Status first;
      for (const auto& sub : *it) {
        Status st = Check(sub, v, path, depth + 1);
        if (st.ok()) {
          ++n;
        } else if (first.ok()) {
          first = st;
        }
      }
      if (n != 1) {
        return n == 0 ? first.WithContext(path + ": no oneOf branch matches")
                      : InvalidArgument(path + ": " + std::to_string(n) +
                                        " oneOf branches match (exactly 1 must)");
      }
    }
    return OkStatus();
  }

 private:
  const json& root_;
};

}  // namespace

Status ValidateJsonSchema(const nlohmann::json& schema, const nlohmann::json& doc) {
  return Validator(schema).Check(schema, doc, "");
}

}  // namespace strata::eval
