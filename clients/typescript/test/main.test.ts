// The one test entry point: every suite shares the same two sidecar processes (started once, in parallel),
// which keeps the run short; they are stopped after the last suite, whatever the outcome.
import { after } from "node:test";
import { stopServers } from "./support/fixture.ts";
import "./errors.suite.ts";
import "./reranker.suite.ts";
import "./client.suite.ts";
import "./readiness.suite.ts";
import "./package.suite.ts";
import "./lifecycle.suite.ts";
import "./retrieval.suite.ts";
import "./memory.suite.ts";
import "./search_options.suite.ts";
import "./chat.suite.ts";
import "./retry.suite.ts";

after(stopServers);
