// The load generator against the in-process fake server with scripted timings (TTFT 100 ms, then one token
// every 10 ms): the measured TTFT, TPOT, ITL, tps/user and throughput must match the script.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>

#include "tools/bench.h"
#include "tools/fake_server.h"
#include "tools/http_client.h"
#include "tools/report.h"
#include "tools_test_util.h"

namespace ds::tools {
namespace {

// Scheduling slack. The fake server sleeps to absolute deadlines, so only wake-up and loopback latency add
// up, but a CI machine running other tests on its 2 cores delays wake-ups by several ms (a late first chunk
// also shortens the decode window that follows). The bounds stay tight enough that a gross formula error
// fails (latency / tokens gives 15.6 ms instead of 10; chunks instead of tokens gives 20 ms); the exact
// formulas are checked on synthetic timestamps in metrics_test.cpp, and each timing test measures again
// (up to 3 attempts) before it reports a miss.
constexpr double kSlackMs = 30;
constexpr int kAttempts = 3;

BenchConfig config(std::vector<int> cs, int out_len, int per_user) {
  BenchConfig c;
  c.concurrencies = std::move(cs);
  c.dataset.input_len = {32, 32};
  c.dataset.output_len = {out_len, out_len};
  c.requests_per_user = per_user;
  c.timeout_s = 30;
  return c;
}

FakeServerOptions scripted(double ttft, double itl) {
  FakeServerOptions o;
  o.ttft_ms = ttft;
  o.itl_ms = itl;
  return o;
}

Progress quiet() { return Progress(stderr, false); }

TEST(BenchE2E, ScriptedTimingsAreMeasured) {
  ds::test::with_retry(kAttempts, [](ds::test::Complaints& c) {
    FakeServer srv(scripted(100, 10));
    srv.start();
    auto cfg = config({1, 4}, 16, 3);
    auto progress = quiet();
    const auto runs = run_sweep(srv.base_url(), cfg, progress);
    ASSERT_EQ(runs.size(), 2u);
    for (const auto& r : runs) {
      const auto& m = r.metrics;
      const std::string at = "c=" + std::to_string(r.concurrency) + " ";
      // Counts are exact whatever the scheduling.
      EXPECT_EQ(m.requests, r.concurrency * 3);
      EXPECT_EQ(m.ok, m.requests);
      EXPECT_EQ(m.counted_from_usage, m.ok);
      EXPECT_EQ(m.output_tokens, 16 * m.ok);
      EXPECT_EQ(m.input_tokens, 32 * m.ok);  // usage.prompt_tokens of a 32-id prompt
      EXPECT_EQ(m.itl_ms.n, 15u * m.ok);
      c.in(m.ttft_ms.median, 100, 100 + kSlackMs, at + "TTFT p50");
      c.in(m.tpot_ms.median, 9, 12, at + "TPOT p50");
      c.in(m.itl_ms.median, 8, 12.5, at + "ITL p50");
      c.in(m.tps_per_user, 83, 111, at + "tps/user");
      c.in(m.e2e_ms.median, 245, 250 + kSlackMs + 10, at + "E2E p50");
      // c users, 3 requests of ~250 ms back to back each: c * 16 * 3 tokens in ~0.75 s.
      c.near(m.output_tps, r.concurrency * 64.0, r.concurrency * 64.0 * 0.2, at + "output tok/s");
      c.near(m.request_rate, r.concurrency * 4.0, r.concurrency * 4.0 * 0.2, at + "req/s");
    }
    EXPECT_EQ(srv.max_in_flight(), 4);  // one request in flight per user, all users at once
    // Warm-up (1 + 4) plus measured (3 + 12) requests reached the server.
    EXPECT_EQ(srv.requests(), 1 + 4 + 3 + 12);
  });
}

TEST(BenchE2E, OutputTokensComeFromUsageNotChunks) {
  ds::test::with_retry(kAttempts, [](ds::test::Complaints& c) {
    FakeServerOptions o = scripted(50, 20);
    o.tokens_per_chunk = 2;  // 16 tokens in 8 chunks, 20 ms apart
    FakeServer srv(o);
    srv.start();
    auto cfg = config({1}, 16, 2);
    cfg.warmup = false;
    auto progress = quiet();
    const auto m = run_sweep(srv.base_url(), cfg, progress)[0].metrics;
    EXPECT_EQ(m.output_tokens, 32);
    // TPOT = 7 gaps * 20 ms / 15 tokens = 9.33 ms; counting chunks would give 20 ms.
    c.near(m.tpot_ms.median, 140.0 / 15, 1.5, "TPOT p50");
    c.near(m.itl_ms.median, 20, 3.0, "ITL p50 (per chunk)");
  });
}

TEST(BenchE2E, WithoutUsageChunksAreCounted) {
  FakeServerOptions o = scripted(20, 10);
  o.report_usage = false;
  FakeServer srv(o);
  srv.start();
  auto cfg = config({1}, 8, 1);
  cfg.warmup = false;
  auto progress = quiet();
  const auto runs = run_sweep(srv.base_url(), cfg, progress);
  EXPECT_EQ(runs[0].metrics.output_tokens, 8);
  EXPECT_EQ(runs[0].metrics.counted_from_usage, 0);
  EXPECT_NE(sweep_markdown(runs).find("counted as chunks"), std::string::npos);
}

TEST(BenchE2E, IgnoreEosFixesOutputLengthsAndIsSent) {
  FakeServerOptions o = scripted(10, 5);
  o.eos_after = 3;
  FakeServer srv(o);
  srv.start();
  auto cfg = config({2}, 8, 1);
  cfg.warmup = false;
  auto progress = quiet();
  auto m = run_sweep(srv.base_url(), cfg, progress)[0].metrics;
  EXPECT_EQ(m.output_tokens, 2 * 3);
  EXPECT_EQ(m.short_outputs, 2);
  cfg.request.ignore_eos = true;
  m = run_sweep(srv.base_url(), cfg, progress)[0].metrics;
  EXPECT_EQ(m.output_tokens, 2 * 8);
  EXPECT_EQ(m.short_outputs, 0);
  const auto bodies = srv.bodies();
  ASSERT_EQ(bodies.size(), 4u);
  const auto& b = bodies.back();
  EXPECT_EQ(b["ignore_eos"], true);
  EXPECT_EQ(b["min_tokens"], 8);
  EXPECT_EQ(b["stream"], true);
  EXPECT_EQ(b["stream_options"]["include_usage"], true);
  EXPECT_EQ(b["model"], "fake-model");  // discovered from /v1/models
  EXPECT_EQ(b["prompt"].size(), 32u);
}

TEST(BenchE2E, ChatEndpoint) {
  ds::test::with_retry(kAttempts, [](ds::test::Complaints& c) {
    FakeServer srv(scripted(30, 10));
    srv.start();
    auto cfg = config({1}, 6, 1);
    cfg.endpoint = EndpointKind::kChat;
    cfg.warmup = false;
    auto progress = quiet();
    const auto m = run_sweep(srv.base_url(), cfg, progress)[0].metrics;
    EXPECT_EQ(m.ok, 1);
    EXPECT_EQ(m.output_tokens, 6);
    c.in(m.tpot_ms.median, 9, 12, "TPOT p50");
    EXPECT_TRUE(srv.bodies()[0]["messages"].is_array());
  });
}

TEST(BenchE2E, FailuresAreReportedNotHidden) {
  // Nothing listens on this port: every request fails with a transport error, and a sweep stops at warm-up.
  FakeServer srv(scripted(1, 1));
  srv.start();
  const std::string url = srv.base_url();
  srv.stop();
  auto cfg = config({2}, 4, 1);
  auto progress = quiet();
  const Dataset ds(cfg.dataset, cfg.endpoint);
  const auto reqs = run_pass(url, cfg, cfg.request, ds, 2, 1, 0, nullptr, "");
  ASSERT_EQ(reqs.size(), 2u);
  for (const auto& r : reqs) {
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("transport error"), std::string::npos) << r.error;
  }
  EXPECT_THROW(run_sweep(url, cfg, progress), std::exception);
  // A 404 (wrong path prefix) is an HTTP error with the status in the message.
  FakeServer srv2(scripted(1, 1));
  srv2.start();
  const auto r404 = run_pass(srv2.base_url() + "/nope", cfg, cfg.request, ds, 1, 1, 0, nullptr, "");
  EXPECT_FALSE(r404[0].ok);
  EXPECT_EQ(r404[0].http_status, 404);
  EXPECT_NE(r404[0].error.find("HTTP 404"), std::string::npos) << r404[0].error;
  // A server that answers with plain JSON instead of a stream is named as such.
  cfg.request.extra = {{"stream", false}};
  const auto plain = run_pass(srv2.base_url(), cfg, cfg.request, ds, 1, 1, 0, nullptr, "");
  EXPECT_FALSE(plain[0].ok);
  EXPECT_NE(plain[0].error.find("does the server stream"), std::string::npos) << plain[0].error;
}

TEST(BenchE2E, PairedAbFindsTheFasterServerAndParity) {
  ds::test::with_retry(kAttempts, [](ds::test::Complaints& c) {
    FakeServer slow(scripted(30, 20)), fast(scripted(30, 10)), twin(scripted(30, 20));
    slow.start();
    fast.start();
    twin.start();
    auto cfg = config({1, 2}, 8, 1);
    AbOptions ab;
    ab.noise_floor_pct = 10;
    ab.max_noise_pct = 50;
    auto progress = quiet();
    const AbRun better = run_ab(slow.base_url(), fast.base_url(), cfg, 2, ab, progress);
    ASSERT_EQ(better.verdicts.size(), 2u);
    for (const auto& v : better.verdicts) {
      c.check(v.verdict == Verdict::kBetter && !v.anomaly, "faster candidate: " + v.verdict_text());
      c.in(v.delta_pct, 50, 200, "delta");  // 20 ms -> 10 ms per token: twice the tps/user (+100 %)
    }
    EXPECT_EQ(better.base.size(), 4u);
    EXPECT_EQ(better.cand.size(), 4u);
    const AbRun same = run_ab(slow.base_url(), twin.base_url(), cfg, 2, ab, progress);
    for (const auto& v : same.verdicts) c.check(v.verdict_text() == "parity within noise", "twin: " + v.verdict_text());
    // Both sides got the same prompts: every prompt the twin saw, the baseline saw too.
    std::set<std::string> base_prompts;
    for (const auto& b : slow.bodies()) base_prompts.insert(b["prompt"].dump());
    for (const auto& b : twin.bodies()) EXPECT_TRUE(base_prompts.count(b["prompt"].dump()));
    const std::string md = ab_markdown(better.verdicts, ab);
    EXPECT_NE(md.find("| 1 |"), std::string::npos);
    EXPECT_NE(md.find("Estimator"), std::string::npos);
  });
}

TEST(BenchE2E, ProgressIsPlainWithoutATerminal) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  Progress p(f, false);
  p.update("x", 1, 0, 2, 0.1);  // nothing on a non-terminal
  PointRun run;
  run.label = "run";
  run.concurrency = 3;
  p.finished(run);
  Progress t(f, true);
  t.update("y", 1, 0, 2, 0.1);
  std::rewind(f);
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  const std::string out(buf, n);
  EXPECT_EQ(out.find("x:"), std::string::npos);
  EXPECT_NE(out.find("c=3 repeat 1"), std::string::npos);
  EXPECT_NE(out.find("\r\033[Ky: 1/2"), std::string::npos);
  std::fclose(f);
}

// A server that exports deltaserve's engine step counters gets the engine-step and TPOT / step columns, from
// the counters' change over the measured pass only (warm-up excluded); one that does not gets neither.
TEST(BenchE2E, EngineStepColumnsComeFromServerMetrics) {
  FakeServerOptions o = scripted(10, 5);
  o.engine_step_ms = 4;  // each chunk after a request's first "took" a 4 ms decode step
  auto cfg = config({1, 3}, 6, 2);
  auto progress = quiet();
  std::vector<PointRun> runs;
  ds::test::with_retry(kAttempts, [&](ds::test::Complaints& c) {
    FakeServer srv(o);
    srv.start();
    runs = run_sweep(srv.base_url(), cfg, progress);
    ASSERT_EQ(runs.size(), 2u);
    for (const auto& r : runs) {
      EXPECT_NEAR(r.server_step_ms, 4.0, 1e-6) << "c=" << r.concurrency;
      EXPECT_EQ(r.server_decode_tokens, 5 * r.concurrency * 2) << "c=" << r.concurrency;  // 5 per request
      // The client side: 5 ms per token after the first, plus the scheduling slack of this file's header (a
      // timing bound, so measured again before it counts as a miss, as in the tests above).
      c.in(r.tpot_token_ms, 4.5, 5.0 + kSlackMs / 5, "c=" + std::to_string(r.concurrency) + " TPOT per token");
    }
  });
  ASSERT_EQ(runs.size(), 2u);
  BenchReport rep;
  rep.title = "t";
  rep.cfg = cfg;
  rep.runs = runs;
  const std::string md = render_markdown(rep);
  EXPECT_NE(md.find("engine step (ms) | TPOT / step |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 4.00 | "), std::string::npos) << md;  // the step column of a row
  const auto j = render_json(rep);
  EXPECT_NEAR(j["runs"][0]["server_step_ms"].get<double>(), 4.0, 1e-6);
  EXPECT_NEAR(runs_from_json(j, "", "stored.json")[1].server_step_ms, 4.0, 1e-6);  // read back too

  FakeServer plain(scripted(10, 5));  // no /metrics page
  plain.start();
  const auto other = run_sweep(plain.base_url(), config({1}, 4, 1), progress);
  EXPECT_TRUE(std::isnan(other[0].server_step_ms));
  EXPECT_EQ(other[0].server_decode_tokens, 0);
  EXPECT_TRUE(std::isfinite(other[0].tpot_token_ms));  // the client side needs no server help
  rep.runs = other;
  EXPECT_EQ(render_markdown(rep).find("engine step (ms)"), std::string::npos);
  EXPECT_FALSE(render_json(rep)["runs"][0].contains("server_step_ms"));
}

TEST(BenchE2E, ReportsCarryEveryRequestAndPlotBothPanels) {
  FakeServer srv(scripted(10, 5));
  srv.start();
  auto cfg = config({1, 2}, 4, 1);
  auto progress = quiet();
  BenchReport rep;
  rep.title = "t";
  rep.cfg = cfg;
  rep.runs = run_sweep(srv.base_url(), cfg, progress);
  const auto j = render_json(rep);
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][1]["requests"].size(), 2u);
  EXPECT_EQ(j["runs"][1]["requests"][0]["chunk_ms"].size(), 4u);
  EXPECT_TRUE(j["metric_definitions"].contains("tps/user"));
  const std::string svg = render_svg(rep);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("tps/user"), std::string::npos);
  EXPECT_NE(svg.find("output tokens/s"), std::string::npos);
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '\n') > 10, true);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  // Stored results read back for a cross-run comparison, labelled as such.
  const auto stored = runs_from_json(j, "", "stored.json");
  ASSERT_EQ(stored.size(), 2u);
  AbOptions cross;
  cross.noise_floor_pct = 15;
  const auto cmp = compare_runs(stored, rep.runs, cross);
  ASSERT_EQ(cmp.size(), 2u);
  EXPECT_EQ(cmp[0].verdict, Verdict::kParity);
  EXPECT_NE(cross_run_markdown(cmp, cross, "stored.json").find("CROSS-RUN"), std::string::npos);
  EXPECT_THROW(runs_from_json(j, "cand", "stored.json"), std::exception);
}

}  // namespace
}  // namespace ds::tools
