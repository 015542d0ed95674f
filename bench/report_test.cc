// Report::Combine: the figures of several rounds of the matrix (--rounds); the
// cost columns of the tables.
#include "bench/report.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace holdfast::bench {
namespace {

Cell Ran(const char* id, int concurrency, double ops_per_sec) {
  Cell c;
  c.id = id;
  c.concurrency = concurrency;
  c.result.ops = static_cast<int64_t>(ops_per_sec);
  c.result.all_ops = c.result.ops;
  c.result.seconds = 1;
  c.result.ops_per_sec = ops_per_sec;
  return c;
}

Report Round(double raw_cycles, double holdfast_cycles) {
  Report r;
  r.AddCell(Ran(kRawCycle, 256, raw_cycles));
  r.AddCell(Ran(kUncontended, 256, holdfast_cycles));
  return r;
}

TEST(ReportCombineTest, EachRatioIsTheMedianOfTheRoundsRatios) {
  // R1 per round: 1.2, 0.5, 0.8. The median cells (raw 2000, holdfast 1500) come
  // from different rounds and would give 0.75; the headline pairs within a round.
  Report combined = Report::Combine({Round(1000, 1200), Round(3000, 1500), Round(2000, 1600)});
  ASSERT_EQ(combined.rounds().size(), 3u);
  EXPECT_DOUBLE_EQ(*combined.rounds()[0].uncontended_vs_raw_cycle, 1.2);
  EXPECT_DOUBLE_EQ(*combined.rounds()[1].uncontended_vs_raw_cycle, 0.5);
  Headline h = combined.ComputeHeadline();
  ASSERT_TRUE(h.uncontended_vs_raw_cycle);
  EXPECT_DOUBLE_EQ(*h.uncontended_vs_raw_cycle, 0.8);
  EXPECT_EQ(h.r1_concurrency, 256);
  EXPECT_FALSE(h.contended_vs_etcd_lock);  // no round ran those cells
  EXPECT_NE(combined.BenchLine().find("uncontended_vs_raw_cycle=0.80 "), std::string::npos)
      << combined.BenchLine();

  const Cell* raw = combined.Find(kRawCycle, 256);
  const Cell* hf = combined.Find(kUncontended, 256);
  ASSERT_NE(raw, nullptr);
  ASSERT_NE(hf, nullptr);
  EXPECT_DOUBLE_EQ(raw->result.ops_per_sec, 2000);
  EXPECT_DOUBLE_EQ(hf->result.ops_per_sec, 1500);

  nlohmann::json j = combined.ToJson();
  ASSERT_EQ(j["rounds"].size(), 3u);
  EXPECT_DOUBLE_EQ(j["rounds"][1]["uncontended_vs_raw_cycle"].get<double>(), 0.5);
  EXPECT_EQ(j["rounds"][2]["cells"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["headline"]["uncontended_vs_raw_cycle"].get<double>(), 0.8);
}

TEST(ReportCombineTest, AnEvenCountTakesTheLowerMiddleAndFailuresStayProblems) {
  Report bad = Round(1000, 400);
  Cell failed;
  failed.id = kContended;
  failed.concurrency = 8;
  failed.setup_error = "UNAVAILABLE: no holdfastd";
  bad.AddCell(failed);
  Report combined = Report::Combine({Round(1000, 900), bad});
  EXPECT_DOUBLE_EQ(*combined.ComputeHeadline().uncontended_vs_raw_cycle, 0.4);
  EXPECT_DOUBLE_EQ(combined.Find(kUncontended, 256)->result.ops_per_sec, 400);
  auto problems = combined.Problems(/*sessions_planned=*/false);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("holdfast_contended c=8: could not run"), std::string::npos)
      << problems[0];
}

TEST(ReportCombineTest, OneReportAloneKeepsItsOwnHeadline) {
  Report one = Round(1000, 700);
  EXPECT_TRUE(one.rounds().empty());
  EXPECT_DOUBLE_EQ(*one.ComputeHeadline().uncontended_vs_raw_cycle, 0.7);
}

std::string Tables(const Report& r) {
  std::FILE* f = std::tmpfile();
  r.PrintTables(f);
  std::string out(static_cast<size_t>(std::ftell(f)), '\0');
  std::rewind(f);
  out.resize(std::fread(out.data(), 1, out.size(), f));
  std::fclose(f);
  return out;
}

std::string LineOf(const std::string& text, const std::string& start) {
  auto at = text.find("\n" + start);
  if (at == std::string::npos) return "";
  auto end = text.find('\n', at + 1);
  return text.substr(at + 1, end - at - 1);
}

TEST(ReportCostsTest, EachCellShowsTheCpuTimePerOperationOfEachProcessMeasured) {
  Report r = Round(1000, 700);
  Cell hf = Ran(kUncontended, 8, 500);
  hf.cpu_ms_per_op = {{"etcd", 1.234}, {"holdfastd", 0.5}, {"bench", 0.25}};
  hf.switches_per_op = {{"etcd", 36.04}, {"holdfastd", 24.96}, {"bench", 4.0}};
  hf.etcd_gc_per_sec = 4.64;
  hf.etcd_requests_per_op = {{"Txn", 2.0}};
  r.AddCell(hf);
  Cell raw = Ran(kRawCycle, 8, 900);
  raw.cpu_ms_per_op = {{"etcd", 0.75}, {"bench", 0.125}};  // no holdfastd in a baseline
  raw.switches_per_op = {{"etcd", 30.0}, {"bench", 6.5}};
  raw.etcd_gc_per_sec = 9.8;
  r.AddCell(raw);

  std::string tables = Tables(r);
  EXPECT_NE(tables.find("CPU ms/op etcd hfd bench switches/op etcd hfd bench  etcd GC/s"),
            std::string::npos)
      << tables;
  std::string hf_row = LineOf(tables, "holdfast acquire+release                 8");
  EXPECT_NE(hf_row.find(" 1.23 0.50 0.25 "), std::string::npos) << hf_row;
  EXPECT_NE(hf_row.find(" 36.0 25.0 4.0        4.6  Txn 2.0"), std::string::npos) << hf_row;
  std::string raw_row = LineOf(tables, "etcd grant+release (2 guarded txns)      8");
  EXPECT_NE(raw_row.find("0.75 - 0.12 "), std::string::npos) << raw_row;
  EXPECT_NE(raw_row.find(" 30.0 - 6.5        9.8  -"), std::string::npos) << raw_row;
  // A cell measured without the figures says so rather than showing zeros.
  std::string bare = LineOf(tables, "holdfast acquire+release               256");
  EXPECT_NE(bare.find(" - - -                      - - -          -  -"), std::string::npos)
      << bare;

  nlohmann::json j = r.ToJson();
  bool found = false;
  for (const auto& c : j["cells"]) {
    if (c["id"] == kUncontended && c["concurrency"] == 8) {
      found = true;
      EXPECT_DOUBLE_EQ(c["cpu_ms_per_op"]["etcd"].get<double>(), 1.234);
      EXPECT_DOUBLE_EQ(c["cpu_ms_per_op"]["bench"].get<double>(), 0.25);
      EXPECT_DOUBLE_EQ(c["switches_per_op"]["holdfastd"].get<double>(), 24.96);
      EXPECT_DOUBLE_EQ(c["etcd_gc_per_sec"].get<double>(), 4.64);
    }
  }
  EXPECT_TRUE(found) << j.dump();
}

TEST(ReportConnectTest, TheCallerBesideNewClientsIsReadAgainstItselfAlone) {
  Report r;
  Cell alone = Ran(kConnectProbe, 0, 50);
  alone.result.latency.p99_ms = 2.0;
  r.AddCell(alone);
  Cell beside = Ran(kConnectProbe, 8, 48);
  beside.result.latency.p99_ms = 6.5;
  r.AddCell(beside);
  Cell connect = Ran(kConnect, 8, 120);
  connect.cpu_ms_per_op = {{"holdfastd", 3.5}};
  r.AddCell(connect);

  const Cell* b = r.Find(kConnectProbe, 8);
  ASSERT_NE(b, nullptr);
  auto ratios = r.RatiosOf(*b);
  ASSERT_TRUE(ratios.count("p99_vs_alone"));
  EXPECT_DOUBLE_EQ(ratios["p99_vs_alone"], 3.25);
  EXPECT_TRUE(r.RatiosOf(*r.Find(kConnect, 8)).empty());

  std::string tables = Tables(r);
  EXPECT_NE(tables.find("== connect: clients connecting anew"), std::string::npos) << tables;
  std::string row = LineOf(tables, "holdfast caller beside them              8");
  EXPECT_NE(row.find("  3.25 "), std::string::npos) << row;
  std::string connect_row = LineOf(tables, "holdfast new client+session              8");
  EXPECT_NE(connect_row.find(" - 3.50 - "), std::string::npos) << connect_row;
}

}  // namespace
}  // namespace holdfast::bench
