"""A small English corpus the tiny model's tokenizer is trained on.

Written for this project (plain prose on everyday and technical topics) so the
byte-level BPE learns common English pieces; it is fixed text, so training on it
is reproducible on every machine.
"""

CORPUS = """\
The morning was cold and bright. A small boat left the harbour before the sun had cleared
the hills, and the fishermen talked quietly about the weather, the price of fuel and the
new school that was being built on the other side of the river. Nobody expected the wind to
change, but by noon the sky had turned grey and the sea was rough.

She opened the window and looked at the garden. The roses were in flower, the grass needed
cutting, and a family of birds had made a nest in the old apple tree. It was going to be a
long summer, she thought, and there would be time for everything: reading, walking, writing
letters to friends, and learning to cook something more interesting than soup.

A serving system for language models receives requests from many users at the same time.
Each request has a prompt, which is a piece of text, and asks the model to continue it. The
system turns the text into tokens, runs the model over the tokens, and produces new tokens
one at a time until the answer is complete or a limit is reached. The first token takes the
longest, because the whole prompt must be processed; after that, every new token needs only
a small amount of work, but it must wait for the next step of the engine.

Two numbers matter to the people who use such a system. The time to first token measures
how long a user waits before anything appears on the screen. The time between tokens
measures how smoothly the answer streams once it has started. A good scheduler keeps both
of them low, even when many requests arrive together, and it decides which work to run
first when there is not enough time to run everything.

In the kitchen, the bread was rising slowly. He measured the flour, added water and salt,
and kneaded the dough for ten minutes until it was smooth. Then he covered the bowl with a
cloth and left it near the stove. Baking is a matter of patience: the yeast does the work,
and the baker mostly waits, checks the oven, and tries not to open the door too often.

The library was quiet except for the sound of pages turning. Students sat at long wooden
tables with their books and notes, and the light from the tall windows fell across the
floor. An old man in the corner was reading a newspaper from another country, and a child
was looking for a book about trains, ships and the history of the railway.

Memory on a graphics card is limited, so the engine stores the keys and values of every
token in fixed blocks. A request that grows simply takes another block from the free list.
When the memory is full, the engine may pause a request, give its blocks to others, and
compute its tokens again later. This is called preemption, and a careful policy chooses the
request whose delay will hurt the least.

Rain fell all afternoon. The streets were full of umbrellas and the buses were late. In the
cafe on the corner, people ordered tea and coffee and waited for the weather to improve.
Someone said that the forecast for tomorrow was better, with sunshine in the morning and a
light wind from the west, and everybody seemed happier after that.

Mathematics begins with counting. One, two, three, four, five, six, seven, eight, nine and
ten are the first numbers every child learns. Later come addition and subtraction, then
multiplication and division, then fractions, decimals and percentages. With practice, the
rules become natural, and a student can solve problems that once seemed impossible.

The mountain path was steep and narrow. We climbed for three hours, stopping often to drink
water and look back at the valley below. Near the top the trees gave way to rocks and snow,
and the air became thin and clear. From the summit we could see the lake, the villages, the
roads and, far away, the line of the coast shining in the evening light.

Good software is written for people as much as for machines. Clear names, short functions
and honest comments help the next reader understand what the code does and why it was
written that way. Tests describe what the program must do, and they catch mistakes before
the users do. When something fails, a clear error message saves hours of searching.

The market opened early on Saturday. Farmers brought vegetables, fruit, cheese, eggs and
honey, and the stalls were covered with bright colours: red tomatoes, green beans, yellow
lemons, purple plums and orange carrots. People walked slowly between the tables, comparing
prices, tasting samples and talking with neighbours they had not seen for a week.

Every program that talks over a network must expect failure. A message may be lost, a
process may stop, and a reply may arrive too late. The controller therefore keeps track of
every request from the moment it arrives until the last byte of the answer has been sent,
and it can send the request to another worker if the first one does not respond in time.

Music filled the hall. The orchestra played an old piece that everyone knew, and the
audience listened without moving. When the last note faded, there was a moment of silence,
and then the applause began, first from a few people near the front and then from the whole
room, louder and louder, until the conductor turned and bowed.

History is full of small decisions that changed large things. A letter that arrived a day
late, a bridge that was built in one place instead of another, a king who fell ill before a
battle: each of these could have turned the story in a different direction. Historians
study such moments carefully, reading old documents and comparing different accounts.

The train left the station at half past eight. Through the window we watched the city give
way to fields, forests and small towns with white churches. A woman sold sandwiches and hot
drinks from a trolley, the children played cards, and the conductor checked our tickets
twice. We arrived in the capital just after noon, tired but excited to begin our holiday.

Questions and answers: What time is it? It is almost nine o'clock. Where are you going? I
am going to the station to meet my sister. How long will you stay? We will stay for two
weeks, if the weather is good. Why are you smiling? Because I have not seen her for a year.
Would you like some help with your bags? Yes, please, thank you very much.

Science advances by asking questions and testing answers. A scientist forms an idea about
how something works, designs an experiment, measures the result and compares it with the
prediction. If the result does not match, the idea must change. Over many years, these
small steps build a picture of the world that is more accurate than any single guess.
"""
