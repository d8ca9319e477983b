// The knowledge folder of real files the retrieval tests read (the sidecar's one knowledge root).
import { mkdirSync, writeFileSync } from "node:fs";
import * as path from "node:path";

/** FAQ records of faq.jsonl: one document each, keyed by id (provenance.documentId). */
export const FAQ = [
  { id: "faq-returns", text: "Items can be returned within 30 days of delivery for a full refund to the original payment method." },
  { id: "faq-shipping", text: "Standard shipping takes 3 to 5 business days; express shipping arrives the next business day." },
  { id: "faq-warranty", text: "Every blender carries a two year warranty that covers the motor and the glass jar." },
  { id: "faq-abroad", text: "We ship abroad to 40 countries; customs duties are paid by the recipient." },
  { id: "faq-password", text: "To reset your account password, use the forgot password link on the sign-in page." },
  { id: "faq-kettle", text: "The K1 kettle holds 1.7 litres of water and boils it in about three minutes." },
];

export const STEPS = ["Greet the customer.", "Ask for the order number.", "Check the order status.", "Offer a solution."];

export function writeKnowledge(root: string): void {
  mkdirSync(path.join(root, "policies"), { recursive: true });
  writeFileSync(path.join(root, "persona.md"), "You are Ada, a support agent for Acme Kitchen. Be brief and friendly.\n");
  writeFileSync(
    path.join(root, "policies", "returns.md"),
    "# Returns policy\n\nItems can be returned within 30 days of delivery.\n" +
      "Refunds go back to the original payment method within 5 business days.\n",
  );
  writeFileSync(
    path.join(root, "policies", "privacy.txt"),
    "We never sell customer data.\nCard numbers are stored by the payment processor, never by Acme Kitchen.\n",
  );
  writeFileSync(path.join(root, "faq.jsonl"), FAQ.map((record) => JSON.stringify(record)).join("\n") + "\n");
  writeFileSync(
    path.join(root, "steps.jsonl"),
    STEPS.map((text, i) => JSON.stringify({ id: `step${i + 1}`, text: `Step ${i + 1}: ${text}` })).join("\n") + "\n",
  );
  writeFileSync(path.join(root, "empty.txt"), "");
}
