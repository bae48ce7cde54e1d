# The research workflow of the AgenticRollout design document (§9.1), as the document writes
# it. The import lines are kernelflow's; its `llm_func` and tools, which the document
# leaves to the reader, are offline stand-ins (examples/agentic_rollout/research_tools.py),
# and the trajectory is returned for the caller to read (the document's function ends
# without) (docs/agents.md, "Examples"). Run:
# python -m examples.agentic_rollout.seed.advanced_integration
import asyncio

from kernelflow.agentic_rollout import AgenticRollout, AgenticRolloutConfig
from examples.agentic_rollout.research_tools import (
    RESEARCH_REPLIES,
    FactCheckTool,
    ScholarTool,
    WebSearchTool,
)
from examples.agentic_rollout.seed.research_agent import ResearchAgent  # registers "research"
from examples.agentic_rollout.your_model import YourLLMFunction

llm_func = YourLLMFunction(RESEARCH_REPLIES)

# examples/agentic_rollout/advanced_integration.py 中的示例  
async def research_workflow():
    config = AgenticRolloutConfig(
        agent_type="research",
        max_steps=8,
        temperature=0.7
    )
    
    rollout = AgenticRollout(config=config, llm_generate_func=llm_func)
    rollout.tools = {
        "web_search": WebSearchTool(),
        "academic_search": ScholarTool(),
        "fact_check": FactCheckTool()
    }
    rollout.agent.set_tools(rollout.tools)
    
    trajectory = await rollout.agent.run_trajectory(
        prompt={
            "content": "Research the latest developments in quantum computing applications",
            "depth": "comprehensive",
            "sources": ["academic", "industry", "news"]
        },
        llm_generate_func=llm_func,
        request_id="quantum_research"
    )
    return trajectory  # kernelflow's: for the caller


if __name__ == "__main__":
    trajectory = asyncio.run(research_workflow())
    for call in trajectory.get_tool_calls():
        print(f"{call.tool_name}({call.tool_args})")
    print(trajectory.get_final_response())
