"""Three 1,600-token prompts through the official openai client, 5 s apart, while the bench runs."""
import sys, time, random, concurrent.futures as cf
from openai import OpenAI
port = sys.argv[1]
client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
model = client.models.list().data[0].id
def one(i):
    time.sleep(5 + 8 * i)
    rng = random.Random(i)
    ids = [rng.randrange(5, 250) for _ in range(1600)]
    t = time.time()
    r = client.completions.create(model=model, prompt=ids, max_tokens=16, temperature=0)
    return i, round(time.time() - t, 2), r.usage.prompt_tokens, r.usage.completion_tokens, r.choices[0].finish_reason
with cf.ThreadPoolExecutor(3) as ex:
    for res in ex.map(one, range(3)):
        print("long", res, flush=True)
