// `holdfast class create|get|list|delete`: lock classes of a namespace (Admin API).
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/common.h"
#include "cli/output.h"
#include "common/names.h"

namespace holdfast::cli {

namespace {

struct CreateFlags {
  std::string ns;
  std::string class_id;
  std::string prefix;
  ClassFlags policy;
  OutputFormat output = OutputFormat::kTable;
};

struct ClassIdFlags {
  std::string ns;
  std::string class_id;
  OutputFormat output = OutputFormat::kTable;
};

struct ListFlags {
  std::string ns;
  OutputFormat output = OutputFormat::kTable;
};

absl::Status ValidateNsAndClass(const std::string& ns, const std::string& class_id) {
  if (auto s = names::ValidateNamespaceName(ns); !s.ok()) return s;
  return names::ValidateClassId(class_id);
}

int PrintOne(const v1::LockClass& cls, OutputFormat output) {
  if (output == OutputFormat::kJson) {
    if (auto s = PrintJson(cls, std::cout); !s.ok()) return ReportError(s);
  } else {
    PrintClass(cls, std::cout);
  }
  return kExitOk;
}

absl::StatusOr<v1::LockClass> BuildClass(const CreateFlags& flags) {
  if (auto s = ValidateNsAndClass(flags.ns, flags.class_id); !s.ok()) return s;
  if (flags.prefix.empty()) {
    return absl::InvalidArgumentError(
        "--prefix must not be empty: the catch-all class comes with the namespace");
  }
  if (auto s = names::ValidateKeyPrefix(flags.prefix); !s.ok()) return s;
  v1::LockClass cls;
  cls.set_namespace_(flags.ns);
  cls.set_class_id(flags.class_id);
  cls.set_key_prefix(flags.prefix);
  if (auto s = ApplyClassFlags(flags.policy, &cls); !s.ok()) return s;
  return cls;
}

int RunCreate(const GlobalOptions& global, const CreateFlags& flags) {
  auto cls = BuildClass(flags);
  if (!cls.ok()) return ReportUsageError(cls.status());
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  auto created = client->CreateClass(*cls);
  if (!created.ok()) {
    return ReportError(created.status(),
                       absl::StrCat("class create ", flags.ns, " ", flags.class_id));
  }
  return PrintOne(*created, flags.output);
}

int RunGet(const GlobalOptions& global, const ClassIdFlags& flags) {
  if (auto s = ValidateNsAndClass(flags.ns, flags.class_id); !s.ok()) return ReportUsageError(s);
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  auto cls = client->GetClass(flags.ns, flags.class_id);
  if (!cls.ok()) {
    return ReportError(cls.status(), absl::StrCat("class get ", flags.ns, " ", flags.class_id));
  }
  return PrintOne(*cls, flags.output);
}

int RunList(const GlobalOptions& global, const ListFlags& flags) {
  if (auto s = names::ValidateNamespaceName(flags.ns); !s.ok()) return ReportUsageError(s);
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  auto list = client->ListClasses(flags.ns);
  if (!list.ok()) return ReportError(list.status(), "class list " + flags.ns);
  if (flags.output == OutputFormat::kJson) {
    v1::ListClassesResponse response;
    for (auto& cls : *list) *response.add_classes() = std::move(cls);
    if (auto s = PrintJson(response, std::cout); !s.ok()) return ReportError(s);
    return kExitOk;
  }
  Table table = ClassTable();
  for (const auto& cls : *list) AddClassRow(cls, &table);
  table.Print(std::cout);
  return kExitOk;
}

int RunDelete(const GlobalOptions& global, const ClassIdFlags& flags) {
  if (auto s = ValidateNsAndClass(flags.ns, flags.class_id); !s.ok()) return ReportUsageError(s);
  int exit_code = kExitOk;
  std::unique_ptr<Client> client = ConnectOrReport(global, &exit_code);
  if (!client) return exit_code;
  if (auto s = client->DeleteClass(flags.ns, flags.class_id); !s.ok()) {
    return ReportError(s, absl::StrCat("class delete ", flags.ns, " ", flags.class_id));
  }
  std::cout << "deleted class " << flags.class_id << " of namespace " << flags.ns << "\n";
  return kExitOk;
}

void AddNsAndClassArgs(CLI::App* cmd, std::string* ns, std::string* class_id) {
  cmd->add_option("ns", *ns, "namespace name")->required();
  cmd->add_option("class_id", *class_id, "class id: [a-z0-9][a-z0-9._-]{0,62}")->required();
}

void AddCreate(CLI::App* parent, CommandContext& ctx) {
  auto flags = std::make_shared<CreateFlags>();
  CLI::App* cmd = parent->add_subcommand(
      "create", "Create a lock class for the lock keys that start with --prefix");
  AddNsAndClassArgs(cmd, &flags->ns, &flags->class_id);
  cmd->add_option("--prefix", flags->prefix,
                  "lock keys starting with this prefix use the class (longest prefix wins)")
      ->required();
  AddClassFlags(cmd, &flags->policy);
  AddOutputOption(cmd, &flags->output);
  SetAction(cmd, ctx, flags, RunCreate);
}

void AddGet(CLI::App* parent, CommandContext& ctx) {
  auto flags = std::make_shared<ClassIdFlags>();
  CLI::App* cmd = parent->add_subcommand("get", "Show a lock class");
  AddNsAndClassArgs(cmd, &flags->ns, &flags->class_id);
  AddOutputOption(cmd, &flags->output);
  SetAction(cmd, ctx, flags, RunGet);
}

void AddList(CLI::App* parent, CommandContext& ctx) {
  auto flags = std::make_shared<ListFlags>();
  CLI::App* cmd = parent->add_subcommand("list", "List the lock classes of a namespace");
  cmd->add_option("ns", flags->ns, "namespace name")->required();
  AddOutputOption(cmd, &flags->output);
  SetAction(cmd, ctx, flags, RunList);
}

void AddDelete(CLI::App* parent, CommandContext& ctx) {
  auto flags = std::make_shared<ClassIdFlags>();
  CLI::App* cmd = parent->add_subcommand(
      "delete", "Delete a lock class (the catch-all class cannot be deleted)");
  AddNsAndClassArgs(cmd, &flags->ns, &flags->class_id);
  SetAction(cmd, ctx, flags, RunDelete);
}

}  // namespace

void RegisterClassCommand(CLI::App& app, CommandContext& ctx) {
  CLI::App* cls = app.add_subcommand("class", "Manage lock classes: create, get, list, delete");
  cls->require_subcommand(1);
  AddCreate(cls, ctx);
  AddGet(cls, ctx);
  AddList(cls, ctx);
  AddDelete(cls, ctx);
}

}  // namespace holdfast::cli
