// SidecarStore through LangGraph.js's own API: BaseStore's methods, and a compiled StateGraph whose nodes use it.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Annotation, END, START, StateGraph, type LangGraphRunnableConfig } from "@langchain/langgraph";
import { createClient } from "@ragsidecar/client";
import { SidecarStore } from "../src/langgraph.ts";
import { withSidecarClient } from "../../test-support.ts";

describe("SidecarStore (LangGraph BaseStore)", () => {
  const sidecar = withSidecarClient(createClient);
  let tenants = 0;
  const store = (options: { ttlMs?: number } = {}) => new SidecarStore({
    client: sidecar.client, knowledge: "memories", principal: { id: "agent-host" }, scope: { tenant: `langgraph-${++tenants}`, session: "s1" }, ...options,
  });

  it("puts, gets, replaces and deletes items by namespace and key", async () => {
    const memory = store();
    await memory.put(["users", "alice"], "food", { text: "Alice is vegetarian.", weight: 3 });
    const item = await memory.get(["users", "alice"], "food");
    assert.deepEqual(item?.value, { text: "Alice is vegetarian.", weight: 3 });
    assert.deepEqual(item?.namespace, ["users", "alice"]);
    assert.equal(item?.key, "food");
    assert.ok(item!.createdAt instanceof Date && item!.updatedAt >= item!.createdAt);
    assert.equal(await memory.get(["users", "bob"], "food"), null);
    assert.equal(await memory.get(["users"], "alice"), null, "namespace and key are not confused");

    await memory.put(["users", "alice"], "food", { text: "Alice is vegan.", weight: 4 });
    assert.deepEqual((await memory.get(["users", "alice"], "food"))?.value, { text: "Alice is vegan.", weight: 4 });
    await memory.delete(["users", "alice"], "food");
    assert.equal(await memory.get(["users", "alice"], "food"), null);
  });

  it("searches under a namespace prefix with a query and a filter, or lists without a query", async () => {
    const memory = store();
    await memory.put(["users", "alice"], "food", { text: "Alice is vegetarian and loves curry.", kind: "preference", weight: 3 });
    await memory.put(["users", "alice"], "pet", { text: "Alice has a cat called Miso.", kind: "fact", weight: 1 });
    await memory.put(["users", "bob"], "food", { text: "Bob eats everything, especially curry.", kind: "preference", weight: 2 });

    const curry = await memory.search(["users", "alice"], { query: "what food does she like?", limit: 5 });
    assert.deepEqual(curry.map((i) => i.key), ["food", "pet"]);
    assert.ok(curry[0]!.score! > curry[1]!.score!);
    const everyone = await memory.search(["users"], { query: "curry", filter: { kind: "preference" }, limit: 5 });
    assert.deepEqual(everyone.map((i) => i.namespace[1]).sort(), ["alice", "bob"]);
    const heavy = await memory.search(["users"], { filter: { weight: { $gte: 2 } } });
    assert.deepEqual(heavy.map((i) => `${i.namespace[1]}/${i.key}`), ["alice/food", "bob/food"]);
    assert.deepEqual((await memory.search(["users"], { limit: 1, offset: 1 })).map((i) => i.key), ["pet"]);

    assert.deepEqual(await memory.listNamespaces(), [["users", "alice"], ["users", "bob"]]);
    assert.deepEqual(await memory.listNamespaces({ prefix: ["users", "bob"] }), [["users", "bob"]]);
    assert.deepEqual(await memory.listNamespaces({ suffix: ["alice"] }), [["users", "alice"]]);
    assert.deepEqual(await memory.listNamespaces({ maxDepth: 1 }), [["users"]]);
  });

  it("refuses a filter it cannot translate", async () => {
    await assert.rejects(store().search(["users"], { filter: { text: { $regex: "cur" } } }), /cannot translate/);
  });

  it("expires items after ttlMs", async () => {
    const memory = store({ ttlMs: 1 });
    await memory.put(["users", "carol"], "brief", { text: "Carol is here for a moment." });
    await new Promise((resolve) => setTimeout(resolve, 20));
    assert.equal(await memory.get(["users", "carol"], "brief"), null);
  });

  it("serves a compiled StateGraph's nodes through config.store", async () => {
    const State = Annotation.Root({
      user: Annotation<string>(),
      message: Annotation<string>(),
      recalled: Annotation<string[]>(),
    });
    let turn = 0;
    const graph = new StateGraph(State)
      .addNode("recall", async (state, config: LangGraphRunnableConfig) => {
        const items = await config.store!.search(["memories", state.user], { query: state.message, limit: 3 });
        return { recalled: items.map((item) => item.value["text"] as string) };
      })
      .addNode("remember", async (state, config: LangGraphRunnableConfig) => {
        await config.store!.put(["memories", state.user], `m${++turn}`, { text: state.message });
        return {};
      })
      .addEdge(START, "recall")
      .addEdge("recall", "remember")
      .addEdge("remember", END)
      .compile({ store: store() });

    await graph.invoke({ user: "alice", message: "My cat is called Miso." });
    await graph.invoke({ user: "bob", message: "My dog is called Rex." });
    const asked = await graph.invoke({ user: "alice", message: "What is my cat called?" });
    assert.deepEqual(asked.recalled, ["My cat is called Miso."]);
  });
});
