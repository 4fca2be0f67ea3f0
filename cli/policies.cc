// `strata policies`: every registered cache policy with its declared settings (kv/settings.h):
// name, type, default, range, shared or not, and help; as a text table, JSON, or the Markdown
// tables embedded in README.md and docs/ (cli/cli_test.cc checks that they match).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "kv/registry.h"

namespace strata::cli {

void AddPoliciesCommand(CLI::App* app, PoliciesOptions* o) {
  CLI::App* cmd = app->add_subcommand(
      "policies", "List every cache policy with its settings: type, default, range, help");
  cmd->add_option("names", o->names, "Only these policies (default: all)");
  cmd->add_flag("--json", o->json, "Print JSON instead of tables");
  cmd->add_flag("--markdown", o->markdown,
                "Print Markdown tables (the settings tables of README.md and docs/)");
  cmd->add_flag("--summary", o->summary,
                "One row per policy (name, settings, what it does) instead of one per setting");
  cmd->footer(
      "Settings are given as NAME:key=value:key=value in --policy (e.g. vestige:recall=off); "
      "shared settings also have a --KEY shorthand flag. NAME@X sets the policy's budget setting "
      "(ratio or bits), e.g. geodesia@2.5.\n");
}

namespace {

std::string Cell(const std::string& s) {
  // Markdown table cells: '|' would end the cell.
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string SettingNames(const PolicySettings& s) {
  if (s.settings.empty()) return "-";
  std::string out;
  for (const SettingDecl& d : s.settings) out += (out.empty() ? "" : ", ") + d.name;
  return out;
}

}  // namespace

int RunPolicies(const PoliciesOptions& o, std::ostream& out, std::ostream& err) {
  std::vector<const PolicyInfo*> list;
  if (o.names.empty()) {
    for (const PolicyInfo& p : Policies()) list.push_back(&p);
  } else {
    for (const std::string& n : o.names) {
      const PolicyInfo* p = FindPolicy(n);
      if (p == nullptr) {
        err << "error: unknown policy '" << n << "' (available: ";
        const auto names = PolicyNames();
        for (size_t i = 0; i < names.size(); ++i) err << (i ? ", " : "") << names[i];
        err << ")\n";
        return kExitUsage;
      }
      list.push_back(p);
    }
  }
  if (o.json && o.markdown) {
    err << "error: give --json or --markdown, not both\n";
    return kExitUsage;
  }
  if (o.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const PolicyInfo* p : list) {
      nlohmann::json s = nlohmann::json::array();
      for (const SettingDecl& d : p->settings.settings) {
        nlohmann::json e = {{"name", d.name},
                            {"type", std::string(SettingTypeName(d.type))},
                            {"default", d.auto_default.empty() ? nlohmann::json(d.def)
                                                               : nlohmann::json(nullptr)},
                            {"default_text", d.DefaultText()},
                            {"range", d.RangeText()},
                            {"shared", d.shared},
                            {"aliases", d.aliases},
                            {"help", d.help}};
        if (d.min) e["min"] = {{"value", *d.min}, {"open", d.min_open}};
        if (d.max) e["max"] = {{"value", *d.max}, {"open", d.max_open}};
        if (!d.choices.empty()) e["choices"] = d.choices;
        s.push_back(e);
      }
      j.push_back({{"name", p->name},
                   {"help", p->help},
                   {"budget", p->settings.budget.empty() ? nlohmann::json(nullptr)
                                                         : nlohmann::json(p->settings.budget)},
                   {"settings", s}});
    }
    out << DumpJson({{"policies", j}});
    return kExitOk;
  }
  if (o.summary) {
    if (o.markdown) {
      out << "| policy | settings | what it keeps and reads |\n|---|---|---|\n";
      for (const PolicyInfo* p : list) {
        out << "| `" << p->name << "` | " << Cell(SettingNames(p->settings)) << " | "
            << Cell(p->help) << " |\n";
      }
    } else {
      Table t({"policy", "settings", "what it keeps and reads"});
      for (const PolicyInfo* p : list) t.AddRow({p->name, SettingNames(p->settings), p->help});
      // Long setting lists and descriptions wrap inside their columns.
      t.WrapColumn(1, 40);
      t.WrapColumn(2, 60);
      t.Print(out);
    }
    return kExitOk;
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const PolicyInfo* p = list[i];
    const PolicySettings& s = p->settings;
    if (o.markdown) {
      out << (i ? "\n" : "") << "`" << p->name << "`: " << p->help << ".";
      if (!s.budget.empty()) out << " `" << p->name << "@X` sets `" << s.budget << "`.";
      out << "\n\n";
      if (s.settings.empty()) {
        out << "No settings.\n";
        continue;
      }
      out << "| setting | type | default | range | shared | help |\n"
          << "|---|---|---|---|---|---|\n";
      for (const SettingDecl& d : s.settings) {
        std::string name = "`" + d.name + "`";
        for (const std::string& a : d.aliases) name += " (alias `" + a + "`)";
        out << "| " << name << " | " << SettingTypeName(d.type) << " | " << Cell(d.DefaultText())
            << " | " << Cell(d.RangeText()) << " | " << (d.shared ? "yes" : "no") << " | "
            << Cell(d.help) << " |\n";
      }
      continue;
    }
    out << (i ? "\n" : "") << p->name << ": " << p->help << "\n";
    if (!s.budget.empty()) out << "  " << p->name << "@X sets " << s.budget << "\n";
    if (s.settings.empty()) {
      out << "  (no settings)\n";
      continue;
    }
    Table t({"setting", "type", "default", "range", "shared", "help"});
    for (const SettingDecl& d : s.settings) {
      std::string name = d.name;
      for (const std::string& a : d.aliases) name += " (alias " + a + ")";
      t.AddRow({name, std::string(SettingTypeName(d.type)), d.DefaultText(), d.RangeText(),
                d.shared ? "yes" : "no", d.help});
    }
    t.WrapColumn(3, 30);
    t.WrapColumn(5, 60);
    t.Print(out);
  }
  return kExitOk;
}

}  // namespace strata::cli
